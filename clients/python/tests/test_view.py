"""The view, as data: notifications in, the view and its events out."""

from meridian_client import Entered, Left, Moved, Position, Reset, StateChanged, View

from messages import entered, left, login_ok, moved, state_changed, view_reset


def test_follows_entered_moved_left_and_state() -> None:
    view = View()
    assert view.apply(login_ok(1, 10, 10)) == []
    [event] = view.apply(entered(2, 20, 10, "bob"))
    assert isinstance(event, Entered) and event.entity.name == "bob" and event.entity.is_player
    view.apply(entered(3, 12, 10, "wolf", kind=1, state=b'{"hp":10,"max":10}'))
    assert [e.id for e in view.npcs(kind=1)] == [3] and [e.id for e in view.players()] == [2]
    assert view.apply(moved(2, 21, 10)) == [Moved(2, Position(21, 10), own=False)]
    assert view.entities[2].position == (21, 10)
    assert view.apply(state_changed(3, b'{"hp":6,"max":10}')) == [StateChanged(3, b'{"hp":6,"max":10}', own=False)]
    assert view.entities[3].state == b'{"hp":6,"max":10}'
    [gone] = view.apply(left(2))
    assert isinstance(gone, Left) and gone.entity.name == "bob"
    assert 2 not in view.entities and view.find("wolf") is not None
    assert view.violations == []


def test_own_ack_and_own_state() -> None:
    view = View()
    view.apply(login_ok(1, 10, 10))
    assert view.apply(moved(1, 11, 10, client_time=7)) == [Moved(1, Position(11, 10), own=True, client_time=7)]
    assert view.own_position == (11, 10)
    view.apply(state_changed(1, b"mine"))
    assert view.own_state == b"mine" and view.entities == {}


def test_view_reset_clears_and_moves_us() -> None:
    view = View()
    view.apply(login_ok(1, 10, 10))
    view.apply(entered(2, 20, 10, "bob"))
    assert view.apply(view_reset(1, 50, 60)) == [Reset(Position(50, 60))]
    assert view.entities == {} and view.own_position == (50, 60)
    view.apply(entered(2, 52, 60, "bob"))
    assert view.entities[2].position == (52, 60)


def test_violations_are_counted_not_applied() -> None:
    view = View()
    view.apply(login_ok(1, 10, 10))
    view.apply(entered(2, 20, 10, "bob"))
    assert view.apply(entered(2, 30, 30, "bob again")) == []
    assert view.apply(moved(9, 1, 1)) == []
    assert view.apply(left(9)) == []
    assert view.apply(entered(1, 10, 10, "me")) == []
    assert view.apply(state_changed(9, b"x")) == []
    assert view.apply(view_reset(5, 0, 0)) == []
    assert len(view.violations) == 6, view.violations
    assert view.entities[2].position == (20, 10) and view.own_position == (10, 10)
