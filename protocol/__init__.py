"""What the audit service and the Flower side both know, so that neither imports the other: the
run-config keys and environment variables a ServerApp attaches with, the headers, the engines'
worker entry points (by name: the service starts them in a worker process and never imports
Flower code), and the model-vector layout (:mod:`.vectors`). No I/O; numpy only."""
