"""A decoder as one value: which method, with which models, rule and settings, priced how.

sample.py, bench.py and tools/harness.py build one (build) and call it on each prompt:

    dec = build("simsd", "models/target", target, rule, drafter)
    tokens, stats = dec(prompt_ids, 64)

The methods: plain decoding (decode.generate), SimSD (speculate.simsd_generate; its variants
through variants.simsd) and Spiffy (spiffy.spiffy_generate). Their speed devices (fast.py) come from
the pricing (measure/pricing.py): which copies a round verifies, and whether SimSD's drafter runs in
a round. Where the tables say no round pays, the method runs its rule alone: decode.generate, the
same tokens.
"""
from dataclasses import dataclass, field

import verify
from decode import DecodeRule, generate
from measure import graphs
from measure.counts import counting
from measure.pricing import MAX_BUCKET, Pricing, price
from measure.reach import method_of
from speculate import Settings, simsd_generate
from spiffy import spiffy_generate
from variants import simsd

SPECS = ("none", "simsd", "spiffy")
VARIANTS = {"verifier", "acceptance", "reference", "lookup_n", "gate", "order"}   # variants.simsd's settings,
DEFAULT = dict(verifier="copies", acceptance="lossless", reference="drafter")   # these: the default SimSD


@dataclass
class Decoder:
    """method: "none" (plain decoding), "simsd" or "spiffy"; settings: the method's own keyword
    arguments (variants.simsd's, spiffy_generate's; plain's fuse_commit); pricing: the tables'
    decisions (None for plain decoding)."""
    method: str
    target: object
    rule: DecodeRule
    drafter: object = None
    settings: dict = field(default_factory=dict)
    pricing: Pricing = None

    def __call__(self, ids, max_new_tokens, generator=None, on_block=None, models=None):
        """Decode after prompt `ids` -> (new token ids, stats). models: (target, drafter) to
        decode with instead of this decoder's own (serve/batch.py's stand-ins, which share
        their forwards among requests)."""
        target, drafter = models or self.models
        if not self.rule_only:
            return self.speculate(target, drafter, ids, max_new_tokens, generator, on_block)
        own = self.settings if self.method == "none" else {}   # (SimSD's or Spiffy's: not generate's)
        return generate(target, ids, max_new_tokens, self.rule, generator=generator, on_block=on_block, **own)

    def speculate(self, target, drafter, ids, max_new_tokens, generator, on_block):
        """SimSD or Spiffy with the pricing's devices (unpriced: every copy verified); its rounds
        counted (measure/counts.py)."""
        run, p = dict(generator=generator, on_block=on_block), self.pricing or Pricing()
        learner = p.learn() if p.learn else None   # this request's (the defaults, priced by tables)
        devices = dict(walk=verify.walk_one_sync, cut=learner.cut if learner and self.method == "spiffy" else p.cut)
        if self.method == "spiffy":
            return counting(spiffy_generate, learner)(target, ids, max_new_tokens, self.rule, **run, **devices,
                                                      **self.settings)
        if any(k in VARIANTS and DEFAULT.get(k) != v for k, v in self.settings.items()):   # variants.py's
            return simsd(target, drafter, ids, max_new_tokens, self.rule, draft=p.draft, **run, **devices,
                         **self.settings)
        own = {k: v for k, v in self.settings.items() if k not in DEFAULT}   # the default SimSD
        settings = Settings(**own, draft=learner.draft if learner else p.draft, **devices)
        out, stats = counting(simsd_generate, learner)(target, drafter, ids, max_new_tokens, self.rule, settings,
                                                       **run)
        return out, dict(stats, reference="drafter")

    @property
    def rule_only(self):
        """Whether this decodes with the rule alone (plain decoding, or priced so)."""
        return self.method == "none" or self.pricing is not None and self.pricing.alone

    @property
    def models(self):
        """(target, drafter or None): the models its forwards run."""
        return self.target, None if self.rule_only else self.drafter

    @property
    def max_blocks(self):
        """The most blocks of queries one target forward carries (a compiled warm-up's)."""
        if self.rule_only or self.settings.get("verifier") == "temporal":
            return 2 if self.rule_only else 3
        rows = self.pricing and self.pricing.max_rows
        return MAX_BUCKET if rows is None else min(MAX_BUCKET, 1 + rows // self.rule.block_size)


def build(spec, target_dir, target, rule, drafter=None, *, settings=None, graph=None, **priced):
    """The decoder for sample.py's --spec `spec` (SPECS) and flags, on the model `target` loaded
    from target_dir. settings: the method's flags (simsd: those of cli.SIMSD_FLAGS, spiffy:
    draft_budget; None for a default); graph: Spiffy's draft graph file (default: beside the
    weights); priced: price()'s keywords (cost table, row cap, device, compile, batch)."""
    settings = {k: v for k, v in (settings or {}).items() if v is not None}
    if spec == "none":
        return Decoder(spec, target, rule, settings=settings)
    if spec == "spiffy":   # (the graph is checked whether the rule runs alone or not)
        settings["graph"] = graphs.load_graph(graph or graphs.graph_path(target_dir, rule), rule)
    method = method_of(spec, settings.get("reference"), settings.get("verifier"))
    pricing = price(method, target_dir, target, rule, drafter, **priced, settings=settings,
                    lossless=settings.get("acceptance", "lossless") == "lossless")
    return Decoder(spec, target, rule, drafter, settings, pricing)
