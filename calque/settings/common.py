"""What every function's settings share: read from the environment by alias, and the
settings common to all (the table, the admins, local mode). The functions' own models are
in calque.settings (the API's) and calque.settings.functions (the others')."""

from __future__ import annotations

import os
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

T = TypeVar("T", bound=BaseModel)


class _EnvSettings(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True, defer_build=True)

    @classmethod
    def from_env(cls: type[T], environ: dict[str, str] | None = None) -> T:
        env = os.environ if environ is None else environ
        values = {}
        for name, field in cls.model_fields.items():
            key = field.alias or name
            if key in env:
                values[key] = env[key]
        return cls.model_validate(values)


def split_csv(value: object) -> object:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


class CommonSettings(_EnvSettings):
    table_name: str = Field(alias="CALQUE_TABLE_NAME", min_length=1)
    admins: list[str] = Field(alias="CALQUE_ADMINS", default=[])
    local_mode: bool = Field(alias="CALQUE_LOCAL_MODE", default=False)
    # The wait queue's fair share (calque.tenancy.fairshare): every function that grants
    # from the queue must decay usage alike, so these are common.
    queue_half_life_s: int = Field(alias="CALQUE_QUEUE_HALF_LIFE_S", default=7 * 24 * 3600, ge=60)
    queue_reserve_after_s: int = Field(alias="CALQUE_QUEUE_RESERVE_AFTER_S", default=3600, ge=0)
    queue_max_wait_s: int = Field(alias="CALQUE_QUEUE_MAX_WAIT_S", default=7 * 24 * 3600, ge=60)
    expiring_notice_s: int = Field(alias="CALQUE_SESSION_EXPIRING_NOTICE_S", default=600, ge=0)

    _split_admins = field_validator("admins", mode="before")(split_csv)

    @field_validator("admins")
    @classmethod
    def _admins_can_match(cls, value: list[str]) -> list[str]:
        # An entry that can never match (or that a member could pose as) fails at cold start.
        from calque.identity import parse_admins

        parse_admins(value)
        return value
