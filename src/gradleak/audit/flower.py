"""A privacy audit inside a Flower federation (flwr >= 1.20 message API; tested with 1.41)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import GradleakError
from ..paths import one_line
from .auditor import FedAvgKeys, LeakageAuditor

try:
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
    from flwr.serverapp import Grid
    from flwr.serverapp.strategy import Strategy
except ImportError as exc:  # pragma: no cover - the fl extra is missing
    from ..errors import ConfigError

    raise ConfigError("the Flower audit needs flwr: pip install 'gradleak[fl]'") from exc

CLIENT_INFO = "client-info"


# A client's name as the rows give it: what a client reports is cut to one line of this many characters.
CLIENT_NAME_CHARS = 100


def client_name(msg: Message) -> str:
    """The client's name for the audit rows: its partition id if it reports one (one line of at
    most :data:`CLIENT_NAME_CHARS` characters: a client chooses it), else its node id."""
    content = msg.content
    info = content.config_records.get(CLIENT_INFO) if hasattr(content, "config_records") else None
    if info is not None and "partition-id" in info:
        return one_line(str(info["partition-id"]), CLIENT_NAME_CHARS)
    for rec in content.metric_records.values():
        if "partition-id" in rec:
            return str(int(rec["partition-id"]))
    return str(msg.metadata.src_node_id)


class AuditedStrategy(Strategy):
    """Wrap ``strategy``; audit each client's update each (audited) round, then delegate."""

    def __init__(self, strategy: Strategy, auditor: LeakageAuditor, *, keys: FedAvgKeys | None = None,
                 arrayrecord_key: str | None = None, num_examples_key: str | None = None):
        self.strategy = strategy
        self.auditor = auditor
        self.keys = keys or FedAvgKeys()
        self.arrayrecord_key = arrayrecord_key or getattr(strategy, "arrayrecord_key", "arrays")
        self.num_examples_key = num_examples_key or getattr(strategy, "weighted_by_key", "num-examples")
        self._sent: dict[int, dict[int, tuple[dict[str, Any], dict[str, Any]]]] = {}

    def __getattr__(self, name: str) -> Any:  # anything else the wrapped strategy offers
        if name == "strategy":
            raise AttributeError(name)
        return getattr(self.strategy, name)

    def summary(self) -> None:
        self.strategy.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        if self.auditor.should_audit(server_round):
            # The model and the public config exactly as sent to each node (a strategy may alter
            # both, even per node); messages sharing one RecordDict are converted once.
            converted: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
            per_node: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
            for msg in messages:
                sent = msg.content
                if id(sent) not in converted:
                    arr = sent.array_records.get(self.arrayrecord_key) or next(iter(sent.array_records.values()), arrays)
                    cfg = sent.config_records.get(getattr(self.strategy, "configrecord_key", "config")) \
                        or next(iter(sent.config_records.values()), config)
                    converted[id(sent)] = (arr.to_torch_state_dict(), dict(cfg))
                per_node[msg.metadata.dst_node_id] = converted[id(sent)]
            self._sent = {server_round: per_node}
        return messages

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        per_node = self._sent.pop(server_round, None)
        if per_node is not None:
            for msg in replies:
                sent = per_node.get(msg.metadata.src_node_id)
                if msg.has_error() or sent is None:
                    continue
                global_weights, train_config = sent
                self._audit_reply(server_round, msg, global_weights, train_config)
        return self.strategy.aggregate_train(server_round, replies)

    def _audit_reply(self, server_round: int, msg: Message, global_weights: dict[str, Any],
                     train_config: dict[str, Any]) -> None:
        """Attack one reply's update under the local training the train config announced (read
        once the reply says how many examples the client trained on: its epochs' steps)."""
        content = msg.content
        arrays = content.array_records.get(self.arrayrecord_key) or next(iter(content.array_records.values()), None)
        metrics = next(iter(content.metric_records.values()), None)
        name = client_name(msg)
        if arrays is None or metrics is None or self.num_examples_key not in metrics:
            self.auditor.log_failure(server_round, name, f"reply lacks an ArrayRecord or {self.num_examples_key!r}",
                                     msg.metadata.src_node_id)
            return
        loss = next((float(metrics[k]) for k in ("train_loss", "train-loss", "loss") if k in metrics), float("nan"))
        num_examples = int(metrics[self.num_examples_key])
        try:
            threat = self.auditor.threat(train_config, self.keys, num_examples)
        except GradleakError as exc:   # the audit never stops the federation
            self.auditor.log_failure(server_round, name, str(exc), msg.metadata.src_node_id)
            return
        self.auditor.audit(server_round, name, global_weights, arrays.to_torch_state_dict(),
                           num_examples=num_examples, threat=threat, loss=loss,
                           node_id=msg.metadata.src_node_id)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)
