"""oxygen_jax: pi0.5 inference that serves actions and language from one shared KV cache."""
