"""Where the services are: the configured addresses, else the ones `leap-stream dev up` started."""

from __future__ import annotations


def _local(service: str) -> str | None:
    try:
        from leap_stream.dev import state

        st = state.load_state(state.Paths.from_env(), service)
        if st is not None and state.pid_alive(st.pid, st.marker):
            return str(st.address)
    except Exception:
        return None
    return None


def resolve_bootstrap(configured: str) -> str:
    address = configured or _local("kafka")
    if not address:
        raise SystemExit("LEAP_KAFKA_BOOTSTRAP is empty and no `leap-stream dev up` broker runs")
    return address


def resolve_redis_url(configured: str) -> str:
    address = configured or _local("redis")
    if not address:
        raise SystemExit("LEAP_REDIS_URL is empty and no `leap-stream dev up` Redis runs")
    return address
