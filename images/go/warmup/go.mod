module warmup

go 1.22
