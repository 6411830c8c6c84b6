"""The streaming worker: Faust agents, output producer, metrics, lag and the rankings client."""
