"""Files mode (option `path`): rows written as Avro files, published exactly once.

Each task writes its rows into Avro files under `path` (local or `s3://`), in Hive-style
partition directories, and uploads them before its batch is decided, under names unique to its
attempt. In the task's Kafka transaction it produces one reference message per file to
`referencesTopic`, and its commit message lists the files, so the decision in the commit log
names exactly the files of the attempts it picked: a read_committed consumer of the references
sees each decided file once, and files of failed attempts are never referenced. The protocol
sees files mode as one `protocol.output.TaskOutput` (and recovery's `Republisher`), loaded only
when `path` is set.

The modules, in the order a batch uses them:

- `plan`: on the driver, the options checked against the input schema (`FilePlan`).
- `output`: in each task, `FilesOutput`, files mode as the task's output.
- `writer`: the task's files (`FileSet`), routed, rolled, bounded, uploaded.
- `arrow_split`, `arrow_avro`: the Arrow path, batches split by directory and encoded natively.
- `spark_rows`: Arrow batches as PySpark's rows, where the Arrow path falls back to rows.
- `partitioning`: the partition directory of each row.
- `naming`: the one grammar of the names under `path`, built and parsed.
- `spark_avro`: the Avro schema of Spark rows, and rows as Avro records.
- `json_schema`: the Avro schema of JSON payloads, inferred and merged per file.
- `avro_names`: what both schema engines share: names, fields, fingerprints.
- `references`: the reference message of each file.
- `republish`: recovery publishing again the references of a decided batch the broker aborted.
- `vacuum`: what `kafka-txn-sink vacuum` may delete (files no decision will ever name).
"""
