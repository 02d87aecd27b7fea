"""One module per subcommand of ``shadowlab``, each a thin layer over its stage.

Every module here exports the same three names, which ``shadowlab/cli.py``'s table reads:

    EXITS                       ((code, meaning), ...): the codes this command returns (its --help)
    add_arguments(parser)       its options
    main(args) -> int           parse nothing, call the stage, return an exit code (exitcodes.py)

A command raises the one error tree (shadowlab/errors.py); cli.py maps it to the exit code.
Adding a subcommand is one module here and one row in cli.py's COMMANDS.
"""
