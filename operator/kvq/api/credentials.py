"""What counts as a credential in an InferenceService, and how it is kept out of status.

A credential travels by reference only (spec.model.tokenSecretRef, Secret-backed env). The
CRD refuses engine arguments that would carry one in the spec (`--hf-token=...`,
`--api-key ...`, any flag whose name has a token/key/secret/password word), and anything
that still reaches status or an Event (an older CRD, an engine that echoes its argv) is
redacted with the same rules.
"""

from __future__ import annotations

import re

# Whole words of a flag name (split at - and _) that mark it as carrying a credential.
# Words, not substrings: --max-num-batched-tokens and --tokenizer are not credentials.
CREDENTIAL_WORDS = ("token", "key", "secret", "password", "apikey", "passwd", "credentials")
_WORDS = "|".join(CREDENTIAL_WORDS)
# RE2 and Python agree on this syntax; the CRD's CEL rule uses the same expression.
CREDENTIAL_FLAG_RE = rf"^--?(?i:([a-z0-9]+[-_])*({_WORDS})([-_][a-z0-9]+)*)(=.*)?$"
CREDENTIAL_ENV_RE = rf"^(?i:([a-z0-9]+_)*({_WORDS})(_[a-z0-9]+)*)$"
REDACTED = "<redacted>"

_FLAG = re.compile(CREDENTIAL_FLAG_RE)
_ENV = re.compile(CREDENTIAL_ENV_RE)
# Under (?i) Python's re matches dotted I (U+0130) and dotless i (U+0131) to [a-z]; RE2, which
# runs the CRD's rule, folds by Unicode case folding and does not. Replaced by a character no
# class of the expressions holds, the twins give RE2's verdicts.
_NOT_FOLDED_BY_RE2 = str.maketrans({"\u0130": "\0", "\u0131": "\0"})
# Secret-looking values wherever they appear in free text (engine logs, messages):
# (pattern, replacement); a replacement keeps the label and hides the value.
_IN_TEXT: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}\b"), REDACTED),  # Hugging Face access tokens
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}\b"), REDACTED),  # OpenAI-style API keys
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {REDACTED}"),
    (
        re.compile(rf"(?i)(--?(?:[a-z0-9]+[-_])*(?:{_WORDS})(?:[-_][a-z0-9]+)*)[= ]\s*[^\s,;'\"]+"),
        rf"\1={REDACTED}",
    ),
    (
        re.compile(rf"(?i)\b((?:[a-z0-9]+_)*(?:{_WORDS})(?:_[a-z0-9]+)*)=[^\s,;'\"]+"),
        rf"\1={REDACTED}",
    ),
)


def is_credential_flag(arg: str) -> bool:
    """True for `--hf-token`, `--api-key=x`, `--db-password=y`; False for `--tokenizer`."""
    return _FLAG.fullmatch(arg.translate(_NOT_FOLDED_BY_RE2)) is not None


def is_credential_env(name: str) -> bool:
    """True for HF_TOKEN, OPENAI_API_KEY, DB_PASSWORD; False for TOKENIZERS_PARALLELISM."""
    return _ENV.fullmatch(name.translate(_NOT_FOLDED_BY_RE2)) is not None


def redact_args(args: list[str] | tuple[str, ...]) -> list[str]:
    """Engine arguments with every credential value replaced (`--api-key X` too)."""
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next and not arg.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        if is_credential_flag(arg):
            flag, eq, _ = arg.partition("=")
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


def redact_text(text: str) -> str:
    """Free text with token-looking values and credential flag values replaced."""
    for pattern, replacement in _IN_TEXT:
        text = pattern.sub(replacement, text)
    return text
