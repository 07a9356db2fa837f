"""V of World Models for graphs: the shared GNN encoder gives a Gaussian latent z of a graph.

The decoder does not rebuild the graph itself (a variable-size graph is not what the dynamics
model needs): it reconstructs a fixed-size summary -- log op-type counts, each op type's share
of the analytic cost, the global features (cost ratios, step fraction, ...) -- and which rules
have a candidate (`rlflow.worldmodel.data.graph_summary`, `rule_applicable`). Loss: reconstruction
(squared error on the summary + binary cross-entropy on applicability) + beta KL(q(z|G) || N(0, I)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch_geometric.data import Batch

from rlflow.nn import GraphEncoder

APPLICABILITY_PRIOR_LOGIT = -4.0


@dataclass
class VAEOutput:
    mu: Tensor  # (B, Z)
    logsigma: Tensor  # (B, Z)
    z: Tensor  # (B, Z): a sample (training) or mu (eval)
    summary: Tensor  # (B, S) reconstructed summary
    applicability_logits: Tensor  # (B, R)


class GraphVAE(nn.Module):
    """Encoder q(z | G) = N(mu(G), diag(sigma(G)^2)) over `GraphEncoder`'s graph embedding;
    decoder z -> (graph summary, per-rule applicability logits).

    Args:
        num_rules: R, the rule set's size (applicability outputs).
        summary_dim: S, the size of the reconstructed summary.
        node_dim, edge_dim, global_dim: feature sizes of the observations.
        latent: Z, the latent size (default 32, as World Models).
        hidden, layers, heads: the GraphEncoder's (default 64, 3, 4).
        decoder_hidden: width of the decoder's hidden layer (default 128).

    Shapes: a `Batch` of B graphs -> `VAEOutput` (mu, logsigma, z (B, Z); summary (B, S);
    applicability_logits (B, R)).
    """

    def __init__(
        self,
        num_rules: int,
        summary_dim: int,
        node_dim: int,
        edge_dim: int,
        global_dim: int,
        latent: int = 32,
        hidden: int = 64,
        layers: int = 3,
        heads: int = 4,
        decoder_hidden: int = 128,
    ) -> None:
        super().__init__()
        self.num_rules, self.summary_dim, self.latent = num_rules, summary_dim, latent
        self.encoder = GraphEncoder(node_dim, edge_dim, global_dim, hidden, layers, heads)
        self.to_mu = nn.Linear(self.encoder.out_dim, latent)
        self.to_logsigma = nn.Linear(self.encoder.out_dim, latent)
        self.decoder = nn.Sequential(
            nn.Linear(latent, decoder_hidden),
            nn.ReLU(),
            nn.Linear(decoder_hidden, decoder_hidden),
            nn.ReLU(),
            nn.Linear(decoder_hidden, summary_dim + num_rules),
        )
        # Most rules apply to no graph of a model: start applicability near "no" (p ~ 0.02),
        # or the BCE summed over hundreds of rules drowns the summary at first.
        with torch.no_grad():
            self.decoder[-1].bias[summary_dim:] = APPLICABILITY_PRIOR_LOGIT

    def encode(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """mu and log sigma of q(z | G), each (B, Z)."""
        _, graph_emb = self.encoder(batch)
        logsigma = self.to_logsigma(graph_emb).clamp(-8.0, 4.0)
        return self.to_mu(graph_emb), logsigma

    def decode(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """The summary (B, S) and the applicability logits (B, R) of latents z (B, Z)."""
        out = self.decoder(z)
        return out[:, : self.summary_dim], out[:, self.summary_dim :]

    def forward(self, batch: Batch, *, sample: bool = True) -> VAEOutput:
        mu, logsigma = self.encode(batch)
        z = mu + torch.randn_like(mu) * logsigma.exp() if sample else mu
        summary, logits = self.decode(z)
        return VAEOutput(mu, logsigma, z, summary, logits)


def vae_losses(
    output: VAEOutput,
    summary: Tensor,
    applicable: Tensor,
    beta: float = 1.0,
    kl_tolerance: float = 0.0,
) -> dict[str, Tensor]:
    """`recon` (summed over outputs, mean over graphs), `kl` (summed over z, mean over graphs)
    and `loss` = recon + beta max(kl, kl_tolerance Z): World Models' free bits, which keep the
    latent from collapsing onto the prior when consecutive graphs differ by one rewrite."""
    squared = (output.summary - summary).pow(2).sum(dim=1)
    bce = nn.functional.binary_cross_entropy_with_logits(
        output.applicability_logits, applicable.float(), reduction="none"
    ).sum(dim=1)
    recon = (squared + bce).mean()
    kl = (
        (0.5 * (output.mu.pow(2) + (2 * output.logsigma).exp() - 1.0 - 2 * output.logsigma))
        .sum(dim=1)
        .mean()
    )
    free = kl_tolerance * output.mu.shape[1]
    return {"recon": recon, "kl": kl, "loss": recon + beta * kl.clamp(min=free)}
