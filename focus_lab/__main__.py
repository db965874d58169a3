from focus_lab.cli import main

main()
