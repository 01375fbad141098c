"""Kafka clients, and nothing of the protocol: the task's transactional producer
(`producer.py`), the driver's transaction-coordinator client (`txn_admin.py`, EndTxn,
DescribeTransactions, ListTransactions), the cluster's facts and the fate probe (`cluster.py`),
their interfaces (`admin_api.py`) and the per-process client cache (`client_cache.py`)."""
