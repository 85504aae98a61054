def scaled_dot_product_attention(*a, **k): raise NotImplementedError
