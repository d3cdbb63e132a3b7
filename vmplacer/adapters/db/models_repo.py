"""The interference model's persisted state (table interference_models)."""

from __future__ import annotations

from sqlalchemy import select

from vmplacer.adapters.db.models import InterferenceModelRow
from vmplacer.core.model.interference import InterferenceModel


class SqlModelRepository:
    def __init__(self, sessions):  # sessionmaker[Session]
        self._sessions = sessions

    def load(self, name: str = "default") -> tuple[InterferenceModel, int | None]:
        """The stored model, or an empty one (the linear predictor) when none is stored."""
        with self._sessions() as session:
            row = session.scalar(select(InterferenceModelRow).where(InterferenceModelRow.name == name))
            if row is None:
                return InterferenceModel(), None
            return InterferenceModel.from_dict(row.state), row.last_run_id

    def save(self, model: InterferenceModel, last_run_id: int | None, name: str = "default") -> None:
        with self._sessions() as session:
            row = session.scalar(select(InterferenceModelRow).where(InterferenceModelRow.name == name))
            if row is None:
                row = InterferenceModelRow(name=name, state={}, observations=0)
                session.add(row)
            row.state = model.to_dict()
            row.observations = model.observations
            row.last_run_id = last_run_id
            session.commit()

    def info(self, name: str = "default") -> dict[str, object] | None:
        with self._sessions() as session:
            row = session.scalar(select(InterferenceModelRow).where(InterferenceModelRow.name == name))
            if row is None:
                return None
            return {"name": row.name, "observations": row.observations, "last_run_id": row.last_run_id,
                    "updated_at": row.updated_at.isoformat()}
