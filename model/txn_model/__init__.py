"""A model of kafka_txn_sink's commit protocol, checked by exhaustive breadth-first search.

Modules: `coordinator` (the brokers' transaction coordinator), `commit_log` (the sink's log and
the owned variant's ownership rules), `state` (one state of the whole system), `protocol` (every
step of drivers, task attempts and the environment), `keyed` (the driver steps of the keyed
variant, the protocol as built), `oracle` (what read_committed consumers
must see), `explore` (the search), `config` (the variant and fault bounds). See README.md.
"""

from model.txn_model.config import Config, Variant
from model.txn_model.explore import Result, StateCapExceeded, explore

__all__ = ["Config", "Result", "StateCapExceeded", "Variant", "explore"]
