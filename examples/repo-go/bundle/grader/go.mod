module grader

go 1.23
