"""The sink's metrics: batches read from the commit log (batches.py), the guard on stuck
transactions read from the brokers (guard.py), both exported for Prometheus (exporter.py);
`kafka-txn-sink metrics` serves them (cli/metrics.py)."""
