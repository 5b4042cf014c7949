module dexworker

go 1.19
