"""The web view's sign-ins, kept on the server (table `web_sessions`).

A sign-in is a random 256-bit id handed to the browser in its cookie; the database holds only
the id's SHA-256, the token's owner and scope and three moments. It ends at the first of:
its absolute end (`lifetime_s` after it began, by the lifetime it was given or the configured one,
whichever is shorter), `idle_s` without a request, sign-out (the row
is deleted, so a copied cookie is dead too), or the token's revocation (the row goes with the
token's, and every look-up joins the token's row, so none outlives it even for a moment).

Every method is one short transaction, so several `vmplacer serve` instances share the rows.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import ColumnElement, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from vmplacer.adapters.db.models import ApiTokenRow, WebSessionRow, utcnow

ID_BYTES = 32  # 256 bits from `secrets`
ID_RE = re.compile(r"^[A-Za-z0-9_-]{43}$")  # what secrets.token_urlsafe(ID_BYTES) spells
WEB_SCOPE = "read"  # the view only reads, whichever token signed in
MAX_PER_TOKEN = 20  # live sign-ins one token may hold; a new one ends the oldest beyond it
# Last use is written at most this often (and at least 10 times per idle period): a sign-in may
# end up to this much before idle_s after its very last request, for one write a minute at most.
TOUCH_EVERY_S = 60.0
# The defaults of the `web:` config section (config.WebSettings), for callers without settings.
DEFAULT_LIFETIME_S = 12 * 3600.0
DEFAULT_IDLE_S = 30 * 60.0


@dataclass(frozen=True)
class WebSession:
    """Who a cookie signs in, and what the view lets them do (`scope`, always read)."""

    actor: str
    token_id: int
    token_scope: str
    scope: str
    created_at: datetime
    expires_at: datetime


def id_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def _aware(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes; everything is stored in UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


class SqlWebSessionStore:
    def __init__(self, sessions: sessionmaker[Session], *, lifetime_s: float, idle_s: float,
                 now: Callable[[], datetime] = utcnow, max_per_token: int = MAX_PER_TOKEN):
        if not lifetime_s > 0 or not idle_s > 0:
            raise ValueError(f"a sign-in's lifetime and idle time must be longer than 0, got {lifetime_s!r}, "
                             f"{idle_s!r}")
        self.sessions = sessions
        self.lifetime = timedelta(seconds=lifetime_s)
        self.idle = timedelta(seconds=idle_s)
        self.now = now  # tests set a clock of their own
        self.max_per_token = max_per_token
        self._touch_every = timedelta(seconds=min(TOUCH_EVERY_S, idle_s / 10))

    def start(self, actor: str, token_id: int, token_scope: str) -> str | None:
        """A new sign-in for the token `token_id`; returns the id for the cookie (never stored),
        or None when the token is gone by now. Ended sign-ins are deleted on the way (one
        statement on a small table), and the token's oldest beyond `max_per_token`."""
        secret = secrets.token_urlsafe(ID_BYTES)
        now = self.now()
        with self.sessions() as db:
            self._prune(db, now)
            kept = db.scalars(select(WebSessionRow.id_hash).where(WebSessionRow.token_id == token_id)
                              .order_by(WebSessionRow.created_at.desc(), WebSessionRow.id_hash)
                              .offset(self.max_per_token - 1)).all()
            if kept:
                db.execute(delete(WebSessionRow).where(WebSessionRow.id_hash.in_(kept)))
            db.add(WebSessionRow(id_hash=id_hash(secret), token_id=token_id, actor=actor[:64],
                                 token_scope=token_scope[:8], scope=WEB_SCOPE, created_at=now, last_seen_at=now,
                                 expires_at=now + self.lifetime))
            try:
                db.commit()
            except IntegrityError:  # the token was revoked between its check and now
                db.rollback()
                return None
        return secret

    def find(self, secret: str) -> WebSession | None:
        """The live sign-in a cookie carries, or None (unknown, ended, or its token revoked). An
        ended one is deleted; a live one's last use is brought up to date."""
        if not ID_RE.match(secret or ""):
            return None
        digest = id_hash(secret)
        now = self.now()
        with self.sessions() as db:
            row = db.scalar(select(WebSessionRow).join(ApiTokenRow, ApiTokenRow.id == WebSessionRow.token_id)
                            .where(WebSessionRow.id_hash == digest))
            if row is None or not hmac.compare_digest(row.id_hash, digest):
                return None
            if self._ended(_aware(row.expires_at), _aware(row.created_at), _aware(row.last_seen_at), now):
                db.execute(delete(WebSessionRow).where(WebSessionRow.id_hash == digest))
                db.commit()
                return None
            if now - _aware(row.last_seen_at) >= self._touch_every:
                db.execute(update(WebSessionRow).where(WebSessionRow.id_hash == digest).values(last_seen_at=now))
                db.commit()
            return WebSession(row.actor, row.token_id, row.token_scope, row.scope, _aware(row.created_at),
                              _aware(row.expires_at))

    def end(self, secret: str) -> bool:
        """Sign-out: the row is deleted, so the cookie is worth nothing wherever it was copied."""
        if not ID_RE.match(secret or ""):
            return False
        with self.sessions() as db:
            deleted = db.execute(delete(WebSessionRow).where(WebSessionRow.id_hash == id_hash(secret))).rowcount
            db.commit()
        return bool(deleted)

    def prune(self, *, now: datetime | None = None, dry_run: bool = False) -> int:
        """Delete (with `dry_run` only count) every ended sign-in: past its end, begun more than
        the configured lifetime ago, or idle too long at `now` (default: the store's clock)."""
        with self.sessions() as db:
            moment = now or self.now()
            if dry_run:
                return int(db.scalar(select(func.count()).select_from(WebSessionRow)
                                     .where(self._ended_rows(moment))) or 0)
            count = self._prune(db, moment)
            db.commit()
        return count

    def _ended(self, expires_at: datetime, created_at: datetime, last_seen_at: datetime, now: datetime) -> bool:
        """The one rule, for one row (what `_ended_rows` says in SQL)."""
        return expires_at <= now or created_at + self.lifetime <= now or last_seen_at + self.idle <= now

    def _ended_rows(self, now: datetime) -> ColumnElement[bool]:
        return or_(WebSessionRow.expires_at <= now, WebSessionRow.created_at <= now - self.lifetime,
                   WebSessionRow.last_seen_at <= now - self.idle)

    def _prune(self, db: Session, now: datetime) -> int:
        return int(db.execute(delete(WebSessionRow).where(self._ended_rows(now))).rowcount or 0)
