from kafka_txn_sink.cli import main

raise SystemExit(main())
