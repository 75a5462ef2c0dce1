"""`ardiff.serve.http` on its own (no server): the Host and Origin rules, the token, the
JSON depth limit (checked by a scan, so no input can make it recurse)."""

from __future__ import annotations

import pytest

from ardiff.errors import ConfigError

pytestmark = pytest.mark.extra("serve")


def test_hosts_ip_addresses_and_localhost_pass_names_need_allowing():
    from ardiff.serve.http import Guard

    guard = Guard()
    for host in ("127.0.0.1:8000", "10.0.0.7", "[::1]:8000", "::1", "localhost:80", "LOCALHOST"):
        assert guard.host_problem(host) is None, host
    assert guard.host_problem("evil.example:8000").startswith("Host: 'evil.example' is not")
    assert guard.host_problem(None) is not None  # HTTP/1.0 without Host: no name to trust
    named = Guard(allowed_hosts=frozenset({"serve.example"}))
    assert named.host_problem("serve.example:443") is None
    assert Guard(allowed_hosts=frozenset({"*"})).host_problem("any.example") is None


def test_origins_none_or_the_server_s_own_pass():
    from ardiff.serve.http import Guard

    guard = Guard()
    assert guard.origin_problem(None, "127.0.0.1:8000") is None          # curl, Python
    assert guard.origin_problem("http://127.0.0.1:8000", "127.0.0.1:8000") is None
    assert guard.origin_problem("https://localhost:8000", "localhost:8000") is None
    for origin in ("http://evil.example", "null", "http://127.0.0.1:9999", "file://"):
        assert guard.origin_problem(origin, "127.0.0.1:8000") is not None, origin
    allowed = Guard(allowed_origins=frozenset({"https://app.example"}))
    assert allowed.origin_problem("https://app.example", "127.0.0.1:8000") is None


def test_the_token_from_a_header_or_the_query():
    from ardiff.serve.http import Guard

    guard = Guard(token="s3cret")
    assert guard.has_token("Bearer s3cret") and guard.has_token("bearer  s3cret ")
    assert guard.has_token(None, "s3cret") and not guard.has_token(None, None)
    assert not guard.has_token("Bearer s3cre") and not guard.has_token("Basic s3cret")
    assert Guard().has_token(None)


@pytest.mark.parametrize("text, depth", [("{}", 1), ('{"a": [[1]]}', 3), ('"[[[["', 0),
                                         ('["\\"[[["]', 1), ("[" * 33, 33)])
def test_nesting_is_measured_outside_strings(text, depth):
    from ardiff.serve.http import _nesting_depth

    assert _nesting_depth(text) == depth


def test_parse_json_errors_are_one_line_naming_what():
    from ardiff.serve.http import MAX_JSON_DEPTH, parse_json

    assert parse_json('{"frames": [1, 2]}', "body") == {"frames": [1, 2]}
    assert parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, "body") is not None
    with pytest.raises(ConfigError, match=r"^body: JSON nested 33 levels deep, more than 32; "
                                          r"send a flatter object$"):
        parse_json("[" * 33, "body")
    with pytest.raises(ConfigError, match=r"^message: not JSON \(Expecting .*\); send a JSON "
                                          r"object$") as bad:
        parse_json("{frames: 3", "message")
    assert "\n" not in str(bad.value)
