"""The two-phase commit of the sink, one module per step, in the order a batch takes them.

Before the tasks, on the driver (`start.py`): check the options against the cluster, make sure
the commit log belongs to this sink, and roll forward every decided batch not yet completed.

1. Prepare, in every task (`prepare.py`): initialise the transactional id of the task's Spark
   partition (`txn_ids.py`), which fences every earlier attempt; hand the rows to the outputs
   (`output.py`: records mode and files mode); flush; report the open transaction's triple and
   offsets to the driver in a `TaskCommit` (`messages.py`).
2. Decide, on the driver (`decide.py`): check every prepared transaction is still open with
   time left, then write the decision put-if-absent in the commit log. This is the commit point.
   (`record.py` holds the check and the put's handling of the progress transaction, which a
   repair's record, `repair.py`, shares.)
3. Complete, on the driver (`complete.py`): EndTxn(commit) for every participant, a fate probe
   where EndTxn errs, republishing of lost file references in files mode, and the completion
   marker.
4. Recover (`recover.py`): the roll-forward above, and the clean-up of open transactions that
   no decision holds, when it is due; the one answer to "which transactions does this sink hold".

`session.py` keeps the driver's clients per process; `stream_writer.py` (streaming queries) and
`batch_writer.py` (`df.write`, one batch of the log per writeId) are what Spark calls.
docs/protocol.md explains each step, its reasons, its bounds and the crash cases.
"""
