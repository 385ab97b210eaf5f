"""quickstart-sklearn-example."""
