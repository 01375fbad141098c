"""``python -m kafka_txn_sink.testing``: see ``kafka_txn_sink.testing.cli``."""

import sys

from kafka_txn_sink.testing.cli import main

sys.exit(main())
