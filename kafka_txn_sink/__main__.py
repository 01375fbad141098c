"""`python -m kafka_txn_sink`: the `kafka-txn-sink` command line."""

from kafka_txn_sink.cli import main

raise SystemExit(main())
