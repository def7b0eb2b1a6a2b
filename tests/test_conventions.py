"""PyTorch's conventions in monet's API: a dtype is a torch dtype or its name."""

import pytest


def test_autocast_takes_a_torch_dtype_as_well_as_its_name():
    torch = pytest.importorskip("torch")
    from monet.api import trace_problem

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    by_dtype = trace_problem(model, torch.randn(4, 8), autocast=torch.bfloat16, cost_model="analytic")
    by_name = trace_problem(model, torch.randn(4, 8), autocast="bfloat16", cost_model="analytic")
    assert [t.dtype for t in by_dtype.tensors] == [t.dtype for t in by_name.tensors]
    assert "bfloat16" in {t.dtype for t in by_dtype.tensors}
    with pytest.raises(ValueError, match=r"torch.bfloat16, torch.float16 \(or its name"):
        trace_problem(model, torch.randn(4, 8), autocast=torch.float64, cost_model="analytic")


def test_an_input_dtype_may_be_a_torch_dtype():
    torch = pytest.importorskip("torch")
    from monet.graph import Example

    (x,) = Example.of((2, 3), dtype=torch.float64).args
    assert x.dtype == torch.float64 and Example.of((2, 3), dtype="float64").spec() == Example.of(
        (2, 3), dtype=torch.float64).spec()
