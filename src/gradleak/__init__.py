"""gradleak: how much private training data leaks from what federated-learning clients share."""

__version__ = "0.1.0"
