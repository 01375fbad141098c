"""Records mode's key and value formats of a Schema Registry (`avro`, `json-schema`): the
options (`options.py`), the schema ids the driver resolves before any task (`resolve.py`), and
the tasks' encoding in Confluent's wire format (`encode.py`, with `spark_json.py` for JSON)."""
