"""The streaming worker: the submissions loop, the Faust app (completions, timers), output
producer, metrics, lag and the rankings client."""
