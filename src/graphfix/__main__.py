from graphfix.cli.app import entry

entry()
