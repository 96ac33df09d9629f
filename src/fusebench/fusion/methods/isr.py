"""Inverse square rank (Mourao, Martins and Magalhaes, 2015): 1 / rank^2."""

from fusebench.fusion.methods import Method, register


def evidence(ranks, config, candidates=None):
    return 1.0 / ranks**2


METHOD = register(Method("isr", "rank", "1 / rank^2", "Mourao, Martins and Magalhaes, Comput. Med. Imaging Graph. 2015",
                         evidence, order=4))
