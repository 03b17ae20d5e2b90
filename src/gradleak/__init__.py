"""gradleak: how much private training data leaks from what federated-learning clients share.

The data flow runs one way (see README, "Architecture")::

    data -> client (threat model) -> SharedUpdate -> defenses -> attack -> Reconstruction
                                                                              |
    ground truth (Batch, kept apart) ---------------------------> evaluation <-+-> report
"""

__version__ = "0.1.0"
