"""Recipes: each command as a plain function (pretrain, finetune, evaluate, sample, info, convert, demo)."""
