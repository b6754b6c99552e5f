"""Connection state: what every adapter shows as `connected` and `problem`."""

from channels.connection import ConnectionState, unreachable
from core.errors import ChannelError


def test_giving_up_says_why_and_connecting_clears_it() -> None:
    state = ConnectionState()
    state.now_connected()

    error = ChannelError("the token was refused: copy it again")
    assert state.cannot_connect(error) is error
    assert not state.connected.is_set() and state.problem == str(error)

    state.now_connected()
    assert state.connected.is_set() and state.problem is None


def test_a_drop_with_a_reason_is_not_connected() -> None:
    state = ConnectionState()
    state.now_connected()
    state.lost("cannot reach it")
    assert not state.connected.is_set() and state.problem == "cannot reach it"


def test_an_unreachable_platform_names_the_setting_to_check() -> None:
    said = unreachable("Slack", "http://x/api/", "[channels.slack].api_url", OSError("refused"))
    assert said == (
        "cannot reach Slack at http://x/api/ (refused): check the network and "
        "[channels.slack].api_url"
    )
