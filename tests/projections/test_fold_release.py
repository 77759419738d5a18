"""`crr bridge release`'s admin event in the fold and the replay: a no-op for the state,
never a dead letter, and a `released` happening in `crr replay --diff`."""

from __future__ import annotations

from crr.projections.envelope import Envelope
from crr.projections.fold import apply
from crr.projections.history import CapturePoint, Replay
from crr.projections.state import ProjectionState
from crr.schemas.codec import encode
from crr.schemas.events import BridgeRelease
from crr.schemas.subjects import release_subject

RELEASE = BridgeRelease(door="slurm", requested_at="2026-12-07T22:00:00.000Z",
                        by="ops@adm1", for_seconds=600.0, reason="maintenance")


def test_the_projector_folds_a_release_as_a_no_op() -> None:
    state = ProjectionState()
    ch = apply(state, Envelope(seq=1, subject=release_subject("slurm"), received_at=10.0,
                               data=encode(RELEASE)))
    assert ch.deadletter is None
    assert not state.hosts
    assert not ch.hosts
    assert not ch.cluster
    assert state.seq == 1


def test_replay_tells_who_released_what() -> None:
    replay = Replay([CapturePoint(seq=0), CapturePoint(seq=5)], log_window=True)
    replay.feed(Envelope(seq=1, subject=release_subject("slurm"), received_at=10.0,
                         data=encode(RELEASE)))
    replay.finish()
    (h,) = replay.happenings
    assert (h.what, h.reporter, h.seq) == ("released", "bridge-slurm", 1)
    assert h.detail == "by ops@adm1: for 600s (maintenance)"
