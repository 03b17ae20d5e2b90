"""Privacy audits of real federations: attack each client's individual update each round."""

# Imported on first use (PEP 562): the auditor needs torch and AuditedStrategy needs flwr, while
# `gradleak audit-flower` checks its flags (audit.command, audit.settings) before loading either.
_LAZY = {"INDEX_COLUMNS": "auditor", "AuditSettings": "auditor", "FedAvgKeys": "auditor", "LeakageAuditor": "auditor",
         "AuditedStrategy": "flower"}


def __getattr__(name: str):  # noqa: ANN202
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(name)


__all__ = ["AuditSettings", "AuditedStrategy", "FedAvgKeys", "INDEX_COLUMNS", "LeakageAuditor"]
