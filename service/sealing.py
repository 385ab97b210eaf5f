"""The canary seed at rest: encrypted with the operator's secret key, so the database alone (a dump,
a backup, a read-only replica) does not reveal any audit's canaries.

The key comes from ``FLAUDIT_SECRET_KEY`` or ``FLAUDIT_SECRET_KEY_FILE`` (one key per line; the
first encrypts, every listed key decrypts: a keyring for rotation). Keys are Fernet keys
(AES-128-CBC with HMAC-SHA256, from ``cryptography``); make one with
``flaudit generate-secret-key``. Stored values are ``fernet:<token>``; a plain decimal seed
(written by a version without encryption) is still read and is encrypted on start-up.
"""

from __future__ import annotations

from collections.abc import Sequence

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

__all__ = ["SeedCipher", "SecretKeyError", "generate_secret_key", "NO_SECRET_KEY", "SEALED_PREFIX"]

SEALED_PREFIX = "fernet:"
NO_SECRET_KEY = (
    "no secret key is configured: the canary seeds are encrypted at rest with it. Set "
    "FLAUDIT_SECRET_KEY=<key> or FLAUDIT_SECRET_KEY_FILE=<file> (make a key with "
    "`flaudit generate-secret-key`; scripts/run.sh keeps one in .flaudit/secret-key) and restart"
)


class SecretKeyError(ValueError):
    """A missing or wrong secret key (the message never contains a key or a seed)."""


def generate_secret_key() -> str:
    """A new random key for ``FLAUDIT_SECRET_KEY``."""
    return Fernet.generate_key().decode("ascii")


class SeedCipher:
    """Encrypts and decrypts canary seeds with a keyring.

    Parameters
    ----------
    keys : sequence of str
        Fernet keys; the first encrypts, all decrypt.

    Raises
    ------
    SecretKeyError
        If ``keys`` is empty or a key is not a Fernet key.
    """

    def __init__(self, keys: Sequence[str]) -> None:
        if not keys:
            raise SecretKeyError(NO_SECRET_KEY)
        fernets = []
        for number, key in enumerate(keys, start=1):
            try:
                fernets.append(Fernet(key.strip().encode("ascii")))
            except (ValueError, UnicodeEncodeError):
                raise SecretKeyError(
                    f"secret key #{number} is not a valid key (32 url-safe base64-encoded bytes); "
                    "make one with `flaudit generate-secret-key`"
                ) from None
        self._keyring = MultiFernet(fernets)
        self.num_keys = len(fernets)

    def __repr__(self) -> str:  # never show a key
        return f"SeedCipher(num_keys={self.num_keys})"

    def seal(self, seed: int) -> str:
        """The stored form of ``seed``, encrypted with the first key."""
        token = self._keyring.encrypt(str(int(seed)).encode("ascii"))
        return SEALED_PREFIX + token.decode("ascii")

    def open(self, stored: str) -> int:
        """The seed from its stored form (a legacy plain decimal seed is returned as is)."""
        if not is_sealed(stored):
            return _seed_value(stored)
        try:
            plain = self._keyring.decrypt(stored[len(SEALED_PREFIX) :].encode("ascii"))
        except InvalidToken:
            raise SecretKeyError(
                "a canary seed cannot be decrypted with the configured secret key(s): the key "
                "was changed without `flaudit rotate-secret-key`, or the old key is missing from "
                "FLAUDIT_SECRET_KEY_FILE"
            ) from None
        return _seed_value(plain)

    def reseal(self, stored: str) -> str:
        """``stored`` encrypted with the first key (rotation)."""
        return self.seal(self.open(stored))


def is_sealed(stored: str) -> bool:
    return stored.startswith(SEALED_PREFIX)


def open_unsealed(stored: str) -> int:
    """The seed of a store without a cipher: only plain seeds can be read."""
    if is_sealed(stored):
        raise SecretKeyError(NO_SECRET_KEY)
    return int(stored)


def _seed_value(text: str | bytes) -> int:
    """A stored seed's integer; a corrupt value is refused without echoing it (``int()``'s own
    message would quote the secret)."""
    try:
        return int(text)
    except ValueError:
        raise SecretKeyError("a stored canary seed is corrupt (not an integer)") from None
