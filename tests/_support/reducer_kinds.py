"""Every reducer kind on a ViT-S/14 (block 6 and the last block), for the torchrun workers'
trace checks, and their results in a comparable form."""

from vitreg.analysis.attention import AttentionAnalysis
from vitreg.analysis.ln_separation import PairSimilarity
from vitreg.fix.compare import Pooled
from vitreg.hooks.reducers import Histogram, Max, Mean, TokenNorms, TopK


def reducers(model):
    last = "blocks.11.hook_resid_post"
    return [
        TokenNorms("blocks.6.hook_resid_post"),
        TokenNorms(last, max_images=5),
        Mean(last),
        Mean(last, of="norm"),
        Mean(last, of="abs"),
        Max(last),
        Max(last, of="norm"),
        Histogram(last),
        TopK(last, k=10),
        PairSimilarity("blocks.6.hook_resid_post"),
        Pooled("ln_final.hook_out"),
        *AttentionAnalysis(max_maps=4).reducers(model)[-2:],
    ]


def results(trace):
    return [(type(r).__name__, r.site, r.n_images, r.result()) for r in trace.reducers]
