"""kombu's ``filesystem://`` transport with atomic message files.

kombu writes a message by opening ``<ts>_<uuid>.<queue>.msg`` and then
writing it; a consumer polling the folder can move and read that file in
between and get an empty body, which crashes Celery's consumer loop
(``JSONDecodeError``). Here a message is written under a temporary name
that no queue matches and renamed into place, so a reader only ever sees
whole messages. Folder layout and file names are otherwise kombu's.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

TMP_PREFIX = ".tmp-"  # ``.tmp-<uuid>``: its part after the first dot names no queue


class Channel(filesystem.Channel):
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        folder = self.data_folder_out
        tmp = os.path.join(folder, f"{TMP_PREFIX}{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.rename(tmp, os.path.join(folder, name))
        except OSError as exc:
            raise ChannelError(f"cannot add message {name!r} to {folder!r}: {exc}") from exc


class Transport(filesystem.Transport):
    Channel = Channel
