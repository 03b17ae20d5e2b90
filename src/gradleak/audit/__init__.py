"""Privacy audits of real federations: attack each client's individual update each round.

* :class:`LeakageAuditor` (framework-agnostic): global weights + a client's weights + the public
  FedAvg hyper-parameters -> a gradleak SharedUpdate -> the chosen attack -> one row of
  DIR/audit.csv (and optionally the reconstruction).
* :class:`gradleak.audit.flower.AuditedStrategy`: wraps any Flower (message API) strategy.
* :mod:`gradleak.audit.example`: a runnable Fashion-MNIST federation (``gradleak audit-flower``).
"""

from .auditor import CSV_COLUMNS, AuditSettings, FedAvgKeys, LeakageAuditor


def __getattr__(name: str):  # noqa: ANN202 - AuditedStrategy needs flwr; import it lazily
    if name == "AuditedStrategy":
        from .flower import AuditedStrategy

        return AuditedStrategy
    raise AttributeError(name)


__all__ = ["AuditSettings", "AuditedStrategy", "CSV_COLUMNS", "FedAvgKeys", "LeakageAuditor"]
