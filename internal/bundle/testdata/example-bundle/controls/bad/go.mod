module example.com/add

go 1.22
