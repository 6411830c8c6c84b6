"""`leap-stream bench`: throughput and latency figures of the service path (docs/benchmarks.md)."""
