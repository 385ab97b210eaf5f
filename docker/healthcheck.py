"""Container health check shared by the flaudit images: GET one URL, exit 0 on a 2xx answer.

Usage: ``python /opt/flaudit/healthcheck.py URL`` (or ``HEALTHCHECK_URL``). For ``https://``
URLs the server certificate is verified against ``HEALTHCHECK_CA_FILE`` when it is set (the
self-signed CA of ``generate-certs.sh``), else against the system store. Standard library only,
so it runs in the Flower base images and in python:slim alike.
"""

import os
import ssl
import sys
import urllib.request


def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("HEALTHCHECK_URL", "")
    if not url:
        print("healthcheck: no URL given", file=sys.stderr)
        return 2
    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context(cafile=os.environ.get("HEALTHCHECK_CA_FILE") or None)
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:  # noqa: S310
            return 0 if 200 <= response.status < 300 else 1
    except Exception as exc:  # any failure means unhealthy
        print(f"healthcheck: {url}: {type(exc).__name__}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
