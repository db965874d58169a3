"""Router training: the training loop and its objectives (LM, coverage, distill), bias calibration, router recipes. Imports method/ and hf/."""
