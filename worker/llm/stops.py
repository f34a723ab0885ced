"""Stop strings over streamed text: text is released only once no stop string can
begin in it, and a stop string found ends the text before it.

A stop string may span deltas ("\\n\\nUser" arriving as "\\n" then "\\nUser"), so
up to ``longest - 1`` characters are held back until the next delta or the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StopScanner:
    stops: list[str]
    _held: str = field(default="", init=False)
    stopped: bool = field(default=False, init=False)

    def feed(self, delta: str) -> str:
        """The part of the text so far that is safe to show; sets ``stopped`` when a
        stop string appeared (the text ends before it, nothing more is shown)."""
        if self.stopped:
            return ""
        text = self._held + delta
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return text[: min(hits)]
        keep = max((len(s) - 1 for s in self.stops), default=0)
        cut = self._safe_cut(text, keep)
        self._held = text[cut:]
        return text[:cut]

    def _safe_cut(self, text: str, keep: int) -> int:
        """Where to split ``text``: everything before cannot start a stop string."""
        cut = max(0, len(text) - keep)
        for start in range(cut, len(text)):
            tail = text[start:]
            if any(s.startswith(tail) for s in self.stops):
                return start
        return len(text)

    def finish(self) -> str:
        """What was held back, once the text has ended without a stop."""
        held, self._held = ("" if self.stopped else self._held), ""
        return held
