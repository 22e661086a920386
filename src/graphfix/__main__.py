from graphfix.cli.app import main

main()
