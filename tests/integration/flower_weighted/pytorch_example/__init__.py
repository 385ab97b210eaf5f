"""pytorch-example: Flower's advanced-pytorch app, offline, audited by flaudit."""
