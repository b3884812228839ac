"""Every secret in a database URL is masked wherever tether shows the URL (issue 28, item 11):
the userinfo's password and every secret-like query parameter (libpq's sslpassword, passfile,
sslkey; a proxy's token or api key), in errors, reprs and the CLI's output."""

from __future__ import annotations

import pytest

from tether import ConfigError, Runtime
from tether.config import redact

SECRET = "s3cr3t-value"


@pytest.mark.parametrize("url", [
    f"postgresql://u@db.example/app?sslpassword={SECRET}",
    f"postgresql://u@db.example/app?sslmode=require&sslpassword={SECRET}&application_name=x",
    f"postgresql://u@db.example/app?passfile=/home/u/{SECRET}",
    f"postgresql://u@db.example/app?sslkey=/keys/{SECRET}.key",
    f"postgresql://u@db.example/app?PASSWORD={SECRET}",
    f"postgresql://u@db.example/app?pass%77ord={SECRET}",  # libpq reads the name unquoted
    f"postgresql://u@db.example/app?auth_token={SECRET}&api_key={SECRET}",
    f"postgresql://u@db.example/app?client_secret={SECRET}",
    f"postgresql://u:{SECRET}@h1:5433,h2:5434/app?target_session_attrs=read-write",
    f"postgresql://u:{SECRET}@db.example/app?sslpassword={SECRET}",
])
def test_no_secret_survives_redact(url: str) -> None:
    shown = redact(url)
    assert SECRET not in shown
    assert shown.startswith("postgresql://u")


def test_what_is_not_secret_is_kept() -> None:
    url = ("postgresql://u:pw@h1:5433,h2:5434/app?sslmode=require&sslpassword=x"
           "&target_session_attrs=read-write")
    assert redact(url) == ("postgresql://u:***@h1:5433,h2:5434/app?sslmode=require"
                           "&sslpassword=***&target_session_attrs=read-write")


def test_errors_and_reprs_mask_query_secrets() -> None:
    with pytest.raises(ConfigError) as info:
        Runtime(f"postgresql://u@127.0.0.1:1/app?sslpassword={SECRET}&pool_max=many")
    assert SECRET not in str(info.value) and "sslpassword=***" in str(info.value)
    rt = Runtime(f"postgresql://u:{SECRET}@127.0.0.1:1/app?sslpassword={SECRET}")
    assert SECRET not in repr(rt)
