"""What ``vitreg export`` reads from the model: the sites (in vitreg's hook vocabulary), the
layers, the token kinds, and the checks that name a bad choice before the model runs."""

from __future__ import annotations

from dataclasses import dataclass

from vitreg.errors import InputError

#: ``--site`` short names -> the block site suffix (``blocks.{i}.<suffix>``)
BLOCK_SITES = {
    "resid_pre": "hook_resid_pre",
    "ln1_in": "ln1.hook_in",
    "ln1_out": "ln1.hook_out",
    "resid_mid": "hook_resid_mid",
    "ln2_out": "ln2.hook_out",
    "mlp_post": "mlp.hook_post",
    "resid_post": "hook_resid_post",
}
FINAL = "ln_final"  # the final norm's output: one "layer", named final
SITES = (*BLOCK_SITES, FINAL)
#: ``--tokens`` names -> the token kind of :meth:`~vitreg.core.layout.TokenLayout.token_types`
TOKEN_KINDS = {"cls": "cls", "registers": "register", "extra": "extra", "patches": "patch"}
#: kind code (the ``kind`` column) -> name
KIND_CODES = ("cls", "register", "extra", "patch")
EXCLUDE_RULES = ("outliers", "sinks")


@dataclass(frozen=True)
class Layer:
    """One exported layer: its key in the files, the site read, the site whose patch norms the
    outlier rule fits (diagnose's residual stream), and the block whose heads give sink keys
    (``None``: the final norm, after every block)."""

    key: str
    site: str
    rule_site: str
    block: int | None

    @property
    def pattern_site(self) -> str | None:
        return None if self.block is None else f"blocks.{self.block}.attn.hook_pattern"


def site_suffix(site: str) -> str:
    """The hook suffix of ``--site`` (a short name or a block suffix such as ``mlp.hook_post``)."""
    if site in BLOCK_SITES:
        return BLOCK_SITES[site]
    if site in BLOCK_SITES.values():
        return site
    raise InputError(f"--site {site!r} is not an exportable site; choose from {', '.join(SITES)}")


def plan_layers(site: str, layers: list[int] | None, n_layers: int) -> list[Layer]:
    """The exported layers of a model with ``n_layers`` blocks (``None``: the last block);
    a layer beyond the model is an :class:`InputError` naming the range."""
    if site in (FINAL, "ln_final.hook_out"):
        if layers:
            raise InputError("--site ln_final is one site after every block; drop --layers")
        return [Layer("final", "ln_final.hook_out", "ln_final.hook_out", None)]
    suffix = site_suffix(site)
    chosen = layers if layers else [n_layers - 1]
    bad = [i for i in chosen if not 0 <= i < n_layers]
    if bad:
        raise InputError(
            f"--layers {bad} beyond the model: it has {n_layers} blocks, 0..{n_layers - 1}"
        )
    if len(set(chosen)) != len(chosen):
        raise InputError(f"--layers names a block twice: {chosen}")
    return [
        Layer(str(i), f"blocks.{i}.{suffix}", f"blocks.{i}.hook_resid_post", i)
        for i in sorted(chosen)
    ]


def check_sites(layers: list[Layer], known: list[str], adapter: str) -> None:
    """Every site the export reads exists in the model (``known``: its hook names)."""
    names = set(known)
    for layer in layers:
        for site in (layer.site, layer.rule_site):
            if site not in names:
                raise InputError(
                    f"the {adapter} adapter has no site {site!r}; its sites are listed by "
                    "`vitreg inspect SPEC`"
                )


def token_kinds(tokens: list[str]) -> list[str]:
    """The layout kinds of ``--tokens`` names (checked)."""
    bad = [t for t in tokens if t not in TOKEN_KINDS]
    if bad or not tokens:
        raise InputError(f"--tokens {bad or tokens}: choose from {', '.join(TOKEN_KINDS)}")
    return [TOKEN_KINDS[t] for t in tokens]
