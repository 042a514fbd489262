"""Model names, built and read in one place. A model the pipeline makes is named by how it was made:

    BASE[+ROUTE][.TUNING][.Ndocs][.Kshot]    base, base+nkb, base+nkb.qa, base.kformer, base+nkb.summaries,
                                             base+nkb.3shot, base.3docs.5shot

BASE is the model a base-model stage built or brought in, ROUTE the knowledge route added to it (an injection's
variant: nkb, nkb-a), TUNING what it was fine-tuned on (qa, a generation task, qa with retrieved documents:
kformer, concat; an edit adds its own part), and `.Ndocs` and `.Kshot` the name a model's answers are filed under
when it is asked with its question's top N retrieved documents in the prompt, or K-shot. The plan, evaluate, the report and export all build names through `ModelName`, and read them back with
`ModelName.parse`, which gives back exactly the text it read (`str(ModelName.parse(s)) == s`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

FINE_TUNED = "qa"  # the tuning of a model fine-tuned on the questions (closed-book)


@dataclass(frozen=True)
class ModelName:
    base: str
    route: str | None = None
    tuning: str | None = None
    documents: int = 0
    shots: int = 0

    def __str__(self) -> str:
        return (self.base + (f"+{self.route}" if self.route else "") + (f".{self.tuning}" if self.tuning else "")
                + (f".{self.documents}docs" if self.documents else "") + (f".{self.shots}shot" if self.shots else ""))

    @classmethod
    def parse(cls, text: str) -> "ModelName":
        """The parts of a name. A name given by hand (a brought model's own, `t5-base`, `Qwen2.5-0.5B`) reads as a
        base with whatever follows its first dot as a tuning: what matters is that the text comes back unchanged."""
        head, _, tail = text.partition(".")
        base, _, route = head.partition("+")
        parts = tail.split(".") if tail else []
        shots, documents = _count(parts, "shot"), _count(parts, "docs")
        return cls(base, route or None, ".".join(parts) or None, documents, shots)

    def tuned(self, tuning: str) -> "ModelName":
        """This model fine-tuned on `tuning` (qa, a task, ...)."""
        return replace(self, tuning=f"{self.tuning}.{tuning}" if self.tuning else tuning)

    def asked(self, shots: int, documents: int = 0) -> "ModelName":
        """The name this model's answers are filed under when it is asked `shots`-shot, with its question's top
        `documents` retrieved documents in the prompt (0, 0: its own)."""
        return replace(self, shots=shots, documents=documents)


def _count(parts: list[str], unit: str) -> int:
    """The count of a last part `Nunit` (N a positive number written plainly), popped off `parts`; else 0."""
    count = parts[-1].removesuffix(unit) if parts else ""
    if count != (parts[-1] if parts else "") and count.isascii() and count.isdigit() and count[0] != "0":
        parts.pop()
        return int(count)
    return 0


def answers_name(model: str, shots: int, documents: int = 0) -> str:
    """The name model `model`'s answers are filed under when it is asked `shots`-shot with `documents` retrieved
    documents in its prompts (0, 0: its own name)."""
    return str(ModelName.parse(model).asked(shots, documents)) if shots or documents else model


def way_of_asking(shots: int, documents: int = 0, prompted: bool = False) -> str:
    """How a report row's model was asked, as its label says it: `5-shot`, or `fine-tuned` (0: the row's model
    fine-tuned on the questions, then asked them alone); a row asked with retrieved documents, or `prompted` (in
    the few-shot prompt with no examples), is never fine-tuned (`0-shot` then)."""
    return f"{shots}-shot" if shots or documents or prompted else "fine-tuned"


def evaluated_name(model: str, shots: int, documents: int = 0, prompted: bool = False) -> str:
    """The name a report row's answers are filed under when its model `model` (before fine-tuning) is asked
    `shots`-shot, or fine-tuned on the questions and asked them (0); a row asked with `documents` retrieved
    documents in its prompts, or `prompted` with no examples, is asked as it is, never fine-tuned."""
    if shots or documents or prompted:
        return answers_name(model, shots, documents)
    return str(ModelName.parse(model).tuned(FINE_TUNED))
