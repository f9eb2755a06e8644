"""fit's progress bar counts against the budget that ends training (the stock bar read "Epoch 11/-2" under a time
limit, where max_epochs is -1)."""

from types import SimpleNamespace

from lightning.pytorch.callbacks import Timer

from dspark_lightning.lightning.callbacks import BudgetProgressBar


def describe(epoch, **trainer):
    bar = BudgetProgressBar()
    bar._trainer = SimpleNamespace(**{"callbacks": [], "max_epochs": -1, "max_steps": -1, "global_step": 0, **trainer})
    return bar._get_train_description(epoch).strip()


def test_time_limit_epochs_and_steps():
    timer = Timer(duration={"minutes": 6, "seconds": 30})
    timer.time_elapsed = lambda stage="train": 161.0
    assert describe(11, callbacks=[timer], max_steps=100000) == "Epoch 11 · 2:41 of 6:30"
    assert describe(3, max_epochs=10) == "Epoch 3/9"
    assert describe(2, max_steps=5000, global_step=1200) == "Epoch 2 · step 1200/5000"
    assert describe(4) == "Epoch 4"
    assert "-" not in describe(11, callbacks=[timer], max_steps=100000)
