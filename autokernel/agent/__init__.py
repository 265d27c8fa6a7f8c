"""The agent: rewrites one op's kernel file, candidate by candidate, each judged by the gate and the benchmark.

- loop.py      the loop (one screen): run() over step(), budgets, the transcript
- providers/   the Model protocol, prices and one turn's retries (common.py); Anthropic (anthropic.py) and
               OpenAI(-compatible) (openai.py) through their official SDKs
- search.py    the offline agent: coordinate descent over launch meta-parameters, as a Model
- evaluate.py  the Evaluator protocol and Feedback; the real one runs gate.verify then the benchmark
- prompt.py    fills the templates in prompts/ (system, task, spec, tools) from the trusted spec and the roofline
- command.py   run_session(): one session for one op with a printed summary (what `autokernel agent` runs)
"""
