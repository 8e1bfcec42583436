"""What the four papers share: the base module :class:`~lit_icl.core.module.ICLModule`, data plumbing
(:mod:`~lit_icl.core.data`, :mod:`~lit_icl.core.seeding`, :mod:`~lit_icl.core.resume`), argument checks and
the one-line errors the CLI prints (:mod:`~lit_icl.core.validation`, :mod:`~lit_icl.core.errors`), the results
format and its figures (:mod:`~lit_icl.core.results`, :mod:`~lit_icl.core.figures`), and smaller helpers, one
concern a module. It re-exports nothing: import from the submodules.
"""
