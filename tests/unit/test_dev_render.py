"""What `dev up` writes for Kafka and Redis, checked without starting them."""

from __future__ import annotations

from pathlib import Path

import pytest

from leap_stream.cli import main
from leap_stream.settings import Settings
from leap_stream.tools.dev import kafka, redis, topics


def _props(text: str) -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
    )


def test_server_properties_for_a_combined_kraft_node(tmp_path: Path) -> None:
    p = _props(kafka.render_server_properties(port=19092, controller_port=19093, data_dir=tmp_path))
    assert p["process.roles"] == "broker,controller"
    assert p["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert p["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert p["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert p["log.dirs"] == str(tmp_path)
    assert p["message.max.bytes"] == p["replica.fetch.max.bytes"] == str(16 * 1024 * 1024)
    assert p["num.partitions"] == "4"
    assert p["group.initial.rebalance.delay.ms"] == "0"
    assert p["auto.create.topics.enable"] == "false"
    assert p["offsets.topic.replication.factor"] == "1"
    on = kafka.render_server_properties(
        port=1, controller_port=2, data_dir=tmp_path, auto_create_topics=True
    )
    assert _props(on)["auto.create.topics.enable"] == "true"


def test_pom_brings_a_logging_backend_that_slf4j_can_see() -> None:
    pom = kafka.render_pom("4.1.0")
    assert "<artifactId>kafka_2.13</artifactId><version>4.1.0</version>" in pom
    assert "<artifactId>log4j-slf4j2-impl</artifactId>" in pom
    # without an slf4j 2 API, Kafka's slf4j 1.7 cannot find log4j-slf4j2-impl: a silent broker
    assert "<artifactId>slf4j-api</artifactId><version>2." in pom


def test_log4j2_config_writes_to_the_log_file(tmp_path: Path) -> None:
    text = kafka.render_log4j2(tmp_path / "kafka.log")
    assert f"appender.file.fileName = {tmp_path / 'kafka.log'}" in text
    assert "rootLogger.appenderRef.file.ref = FILE" in text


def test_java_command_uses_heap_and_config(tmp_path: Path) -> None:
    cmd = kafka.java_command(
        tmp_path, tmp_path / "l.properties", "-Xms1m -Xmx2m", "Main", "a", jvm_opts="-XX:+X -Dy=z"
    )
    assert cmd[1:5] == ["-Xms1m", "-Xmx2m", "-XX:+X", "-Dy=z"]
    assert f"-Dlog4j2.configurationFile={tmp_path / 'l.properties'}" in cmd
    assert cmd[-4:] == ["-cp", f"{tmp_path}/*", "Main", "a"]


def test_redis_command_keeps_nothing_on_disk(tmp_path: Path) -> None:
    cmd = redis.redis_command("redis-server", 7000, tmp_path, tmp_path / "r.log", tmp_path / "p")
    pairs = dict(zip(cmd[1::2], cmd[2::2], strict=True))
    assert pairs["--save"] == "" and pairs["--appendonly"] == "no"
    assert pairs["--port"] == "7000" and pairs["--bind"] == "127.0.0.1"
    assert pairs["--logfile"] == str(tmp_path / "r.log")


def test_topic_retention_from_config() -> None:
    cfg = Settings.from_env(
        {
            "LEAP_TOPIC_RETENTION_MS": "1000",
            "LEAP_DLQ_RETENTION_MS": "2000",
            "LEAP_TOPIC_DEAD_LETTER": "my.dlq",
        }
    )
    assert topics.topic_config("my.dlq", cfg) == {"retention.ms": "2000"}
    assert topics.topic_config("leap.rankings", cfg) == {"retention.ms": "1000"}
    assert cfg.topics[-1] == "my.dlq"


def test_dev_status_on_an_empty_home(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import orjson

    assert main(["dev", "status", "--json", "--home", str(tmp_path)]) == 0
    info = orjson.loads(capsys.readouterr().out)
    assert info["kafka"]["running"] is False and info["redis"]["running"] is False
    assert info["kafka"]["log"] == str(tmp_path / "logs" / "kafka.log")


def test_topics_create_without_a_broker_says_how(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("LEAP_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("LEAP_HOME", str(tmp_path))  # no `dev up` broker to fall back on
    assert main(["topics", "create"]) == 2
    assert "dev up" in capsys.readouterr().err


def test_unreachable_configured_service_is_not_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Somebody's real Redis being down must be an error, not a silent local substitute."""
    from leap_stream.tools.dev import ensure_services, state

    monkeypatch.setenv("LEAP_REDIS_URL", f"redis://127.0.0.1:{state.free_port()}/0")
    with pytest.raises(RuntimeError, match="does not answer"):
        ensure_services(kafka=False, redis=True, home=tmp_path)


def test_tail_file_shows_only_this_start(tmp_path: Path) -> None:
    log = tmp_path / "k.log"
    log.write_text("old run\n")
    offset = log.stat().st_size
    with log.open("a") as fh:
        fh.write("new 1\nnew 2\n")
    assert kafka.tail_file(log, since=offset) == "new 1\nnew 2"
    assert kafka.tail_file(log, lines=1) == "new 2"
    assert kafka.tail_file(tmp_path / "missing.log") == "(no log yet)"


def test_cluster_ids_never_start_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leading '-' made StorageTool's argparse read the id as an option (seen in a CI run)."""
    import base64
    import uuid

    from leap_stream.tools.dev import kafka

    # the first draw encodes to an id starting with '-', the second does not
    dash = uuid.UUID(bytes=base64.urlsafe_b64decode("-" + "A" * 21 + "=="))
    plain = uuid.UUID(int=1)
    draws = iter([dash, plain])
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(draws))
    cid = kafka.new_cluster_id()
    assert not cid.startswith("-")
    assert len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_format_passes_the_cluster_id_as_one_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leap_stream.tools.dev import kafka

    seen: list[list[str]] = []

    class Done:
        returncode = 0
        stdout = ""
        stderr = ""

    def fake_run(cmd: list[str], **_kw: object) -> Done:
        seen.append(cmd)
        return Done()

    monkeypatch.setattr(kafka.subprocess, "run", fake_run)
    (tmp_path / "cluster.id").write_text("-leadingDashIdAAAAAAAAA\n")
    assert kafka.format_storage(tmp_path, tmp_path, tmp_path / "p", tmp_path / "l")
    assert "--cluster-id=-leadingDashIdAAAAAAAAA" in seen[0]
