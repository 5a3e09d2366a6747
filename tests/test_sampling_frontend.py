"""The front end's side of logprobs (issue 36 §3): what a Call asks reaches the engine request, and
a step report's logprobs, prompt logprobs and a scoring-only request's end reach its Handle."""

from __future__ import annotations

import asyncio
import multiprocessing

from splash_core.engine.messages import AddRequest, EngineReady, StepReport, TokenLogprob
from splash_core.runtime.sampling import SamplingParams
from splash_core.server.frontend import Frontend
from splash_core.server.protocol import Call, Served


def test_a_handle_gets_its_logprobs_prompt_logprobs_and_a_scoring_only_end():
    async def main():
        here, engine = multiprocessing.Pipe()
        served = Served("tiny", 384, 4096, None, lambda prompt, new: "")
        front = Frontend(served, here, {})
        front.attach_loop(asyncio.get_running_loop())
        front._on_message(EngineReady("TP", "splash", 64, {}))
        pen = SamplingParams(repetition_penalty=1.2, min_p=0.1, min_tokens=1)
        scored = front.submit(Call("completions", (1, 2, 3), 0, SamplingParams(), logprobs=2, echo=True))
        talks = front.submit(Call("completions", (4, 5), 2, pen, logprobs=1))
        sent = [engine.recv() for _ in range(2)]
        assert sent == [AddRequest(scored.id, (1, 2, 3), 0, SamplingParams(), logprobs=2, prompt_logprobs=2),
                        AddRequest(talks.id, (4, 5), 2, pen, logprobs=1, prompt_logprobs=None)]
        prompt = (None, TokenLogprob(2, -1.5, ((7, -0.5), (2, -1.5))), TokenLogprob(3, -0.25, ((3, -0.25), (9, -2.0))))
        first, second = TokenLogprob(11, -0.1, ((11, -0.1),)), TokenLogprob(12, -0.2, ((12, -0.2),))
        front._on_message(StepReport(0, "TP", tokens=((talks.id, 11),), finished=((scored.id, "length"),),
                                     logprobs=((talks.id, first),), prompt_logprobs=((scored.id, prompt),)))
        assert scored.done and scored.finish_reason == "length" and scored.token_ids == []
        assert scored.prompt_logprobs == list(prompt) and scored.logprobs == []
        assert await scored.events.get() == ("token", "", None, "length")
        front._on_message(StepReport(1, "TP", tokens=((talks.id, 12),), finished=((talks.id, "length"),),
                                     logprobs=((talks.id, second),)))
        assert talks.logprobs == [first, second] and talks.prompt_logprobs is None and talks.finish_reason == "length"
        assert front.in_flight == 0

    asyncio.run(main())
