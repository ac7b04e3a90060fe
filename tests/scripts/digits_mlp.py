"""The digits MLP (64-32-10) in plain numpy, shared by the algorithm scripts."""
import numpy as np


def digits():
    """(train x, train y, test x, test y): sklearn's 8x8 digits, 1500 for training."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target
    return x[:1500], y[:1500], x[1500:], y[1500:]


def init_params(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"w1": (rng.standard_normal((64, 32)) * 0.1).astype(np.float32),
            "b1": np.zeros(32, np.float32),
            "w2": (rng.standard_normal((32, 10)) * 0.1).astype(np.float32),
            "b2": np.zeros(10, np.float32)}


def grads(p, x, y):
    h = np.maximum(x @ p["w1"] + p["b1"], 0)
    z = h @ p["w2"] + p["b2"]
    z = z - z.max(1, keepdims=True)
    pr = np.exp(z)
    pr /= pr.sum(1, keepdims=True)
    pr[np.arange(len(y)), y] -= 1
    pr /= len(y)
    g = {"w2": h.T @ pr, "b2": pr.sum(0)}
    dh = (pr @ p["w2"].T) * (h > 0)
    g["w1"], g["b1"] = x.T @ dh, dh.sum(0)
    return {k: v.astype(np.float32) for k, v in g.items()}


def accuracy(p, x, y) -> float:
    h = np.maximum(x @ p["w1"] + p["b1"], 0)
    return float(((h @ p["w2"] + p["b2"]).argmax(1) == y).mean())
