"""Records mode: each input row becomes one Kafka record, with the columns Spark's own Kafka
sink reads (`columns.py`), from rows or from Arrow batches (`arrow.py`), as a task output
(`output.py`)."""
