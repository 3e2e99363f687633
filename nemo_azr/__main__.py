from nemo_azr.cli import entry

entry()
